import sys

from autoplan.cli import main

sys.exit(main())
