"""Building, running and timing models: the original and its rewrite loaded side by side, workloads,
first calls in fresh processes, steady state, Dynamo's accounting, zoo runs and `regionalize tune`.
`regionalize verify` and the scripts in scripts/ measure with it; the verifier proper is verify/."""
