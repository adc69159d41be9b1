"""The `codemode` command."""


def main() -> None:
    raise SystemExit("codemode: not built yet")
