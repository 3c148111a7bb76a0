"""What a notebook draws from the learner's own runs: plots, collectives as boxes, the process tree, the replicas, the
collective sequences, the step timeline, the learning-rate sweep, leaving the group."""
