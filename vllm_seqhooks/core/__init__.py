"""Pure decisions and the data they work on (no vLLM, no torch): the request
tree, a family's limits, fair share, where a child waits, the join plan,
the batch order, KV block arithmetic, the trace. The engine asks, these
answer; they import only each other."""
