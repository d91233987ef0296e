"""``make demo``: the main job on its embedded defaults (filled in by the bundle and agent work)."""

from __future__ import annotations


def main() -> None:
    print("dsplatform demo: nothing to show yet")


if __name__ == "__main__":
    main()
