"""One module per CLI sub-command (``add_parser`` + ``run``)."""
