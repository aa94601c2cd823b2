"""What a run costs and when it ends: prices and the budget guard, the ledger of spend and tokens, the ETA projector,
and the forecast it feeds."""
