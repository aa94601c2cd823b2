"""How much the engine may send and where: the adaptive concurrency limit, the slots, the weighted round robin, and the
endpoints that carry them."""
