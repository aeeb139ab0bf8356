"""Allow ``python -m kit`` as an alias of the ``charllm-kit`` console script."""

from kit.cli.commands import main

if __name__ == "__main__":
    main()
