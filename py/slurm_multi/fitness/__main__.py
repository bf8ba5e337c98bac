import sys

from slurm_multi.fitness.cli import main

sys.exit(main(sys.argv[1:]))
