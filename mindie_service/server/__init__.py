"""The HTTP(S) frontend: Tornado listeners for the business, management and metrics planes."""
