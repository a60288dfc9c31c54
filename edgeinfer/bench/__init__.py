"""Benchmarks: every ruler and floor (`edgeinfer bench`, `bench engines`, `bench spec`, `bench transport`).
Measures everything below it; imported by nothing but the command line."""
