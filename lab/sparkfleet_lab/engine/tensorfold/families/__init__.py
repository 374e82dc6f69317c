"""Model families (the double has one)."""
