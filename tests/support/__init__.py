"""What the tests share: waiting for a condition, a fake clock, a real daemon on a simulated board,
and the fixtures built again and again. Tests import from here, never from each other."""
