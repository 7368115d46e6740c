"""The deterministic fleet simulator: the book's Lab 6.1 to the token, and the capacity planner."""
