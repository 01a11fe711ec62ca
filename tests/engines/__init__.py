"""Engine outputs as each engine really emits them, built from the engines' own source,
tests and docs (each module names the files and versions its shapes come from)."""
