"""`python -m inferflux serve ...` (or `router ...`) runs the same CLI as the `inferflux`
console script."""

from inferflux.cli.main import main

if __name__ == "__main__":
    main()
