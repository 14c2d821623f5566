"""The remote-agent loop and its contract (DESIGN.md, "Contract rules"). No Django in here."""
