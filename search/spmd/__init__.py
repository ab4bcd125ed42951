"""The SPMD sharding search (Rhino §4): strategies per instruction (`builder`, `rules`,
`strategy`, `spec`), their costs (`comm`, `reshard`), the ILP and its reductions
(`problem` lives one level up, shared; `reduce`, `merge`, `solver`, `budget`,
`combine`), and the plan (`planner`, `plan`, `baselines`, `meshsearch`, `pins`)."""
