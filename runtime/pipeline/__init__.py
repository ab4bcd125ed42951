"""Running a stage plan (Rhino §6): each stage's programs (`programs`), the micro-batch
rewrite of the step (`microbatch`, `rewrite`), the task graph and its static 1F1B or
GPipe order (`tasks`), the controller that runs the tasks on the stages' devices
(`controller`, `run`), and what the run measured (`report`)."""
