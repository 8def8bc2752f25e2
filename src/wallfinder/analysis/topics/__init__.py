"""The rank's time findings, one module per topic (`rules.TOPICS` lists them in the order
their rules run)."""
