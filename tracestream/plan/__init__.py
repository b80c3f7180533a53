"""The plan: guides, lanes and the report, every decision before a byte is written."""
