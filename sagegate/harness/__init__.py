"""The lab's harness: what the demo, the tests and the benchmarks start and drive (child processes,
a private Redis, the live set-ups and their simulated twin). It may import every product package;
none imports it but ``sagegate`` (the command line)."""
