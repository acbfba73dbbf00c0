"""The contract's messages built from domain records, below every layer that answers with them."""
