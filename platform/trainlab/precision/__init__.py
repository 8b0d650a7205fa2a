"""Precision modes: one recipe each (recipes), fp16 and low-bit emulation, and which device runs
which (capability). Each mode's specification is vocabulary (trainlab.vocab.precision): config
reads it, so it sits below config; the recipes here sit above it."""
