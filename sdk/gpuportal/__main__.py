"""`python -m gpuportal` runs the command line."""

from gpuportal.cli import main

main()
