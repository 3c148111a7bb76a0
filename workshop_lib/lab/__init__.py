"""What a notebook uses to run and show things: the torchrun launcher, forked ranks, plots, write_script."""
