"""Rollouts: session records (`session`), the synchronous engine (`engine`),
packing into training arrays (`packing`) and the token ledger (`ledger`)."""
