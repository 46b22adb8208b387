"""`swapcast serve` as the CLI runs it, with ICE on loopback only so a test client on this host connects."""

import sys

from app.cli import main
from app.media.peer import use_host_addresses

if __name__ == "__main__":
    use_host_addresses(["127.0.0.1"])
    sys.exit(main(["serve", *sys.argv[1:]]))
