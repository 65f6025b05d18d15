import sys

from rocketmq_dedup.cli import main

sys.exit(main())
