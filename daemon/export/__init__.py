"""``evald export``: stored results written in other tools' formats (one module per format)."""
