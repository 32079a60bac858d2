import sys

from tjpipe.cli import main

sys.exit(main())
