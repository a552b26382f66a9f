"""One module per layout, each with ``build(tmp: Path) -> LayoutCase`` (see ``tests.checkpoints``)."""
