"""This dialect's numbered migrations (``NNNN_name.sql``), applied in order, never edited once shipped."""
