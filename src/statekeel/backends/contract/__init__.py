"""The storage contract by state kind: each module holds a kind's records and its backend ABC."""
