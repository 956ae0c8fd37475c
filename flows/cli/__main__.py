"""`python -m thresher.flows.cli`: the `thresher` command line."""

from thresher.flows.cli import main

main()
