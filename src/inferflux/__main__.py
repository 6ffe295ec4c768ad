"""`python -m inferflux serve ...` runs the same CLI as the `inferflux` console script."""

from inferflux.cli.serve import main

if __name__ == "__main__":
    main()
