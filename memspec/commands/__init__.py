"""One module per ``memspec`` subcommand; each defines ``main(argv) -> int``."""
