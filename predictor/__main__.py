"""``python -m predictor``."""

from predictor.cli import main

if __name__ == "__main__":
    main()
