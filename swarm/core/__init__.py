"""The domain: records, decisions and bucket arithmetic, and every port. Standard library only."""
