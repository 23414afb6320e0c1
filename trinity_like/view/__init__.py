"""See what a run did: ``trinity-like view`` (a local web page) and ``trinity-like report`` (one HTML file)."""
