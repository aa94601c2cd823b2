"""The monitor's screens: dashboard, mismatches, token diff, sample detail, jobs, help, confirm."""
