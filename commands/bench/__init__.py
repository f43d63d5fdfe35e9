"""`baton bench`: each daemon's hot path measured against a reference taken in the same run."""
