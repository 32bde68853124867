"""What training costs: step times, peak memory and ``barter-mini bench`` (Tables 6-9, 14,
15, 17; Figures 1, 3, 4, 7).

Builds and steps every method, so it sits above ``training``; needs only the package's core
dependencies (no pandas or plotting)."""
