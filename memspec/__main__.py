import sys

from memspec.cli import main

sys.exit(main())
