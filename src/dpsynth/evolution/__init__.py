"""dpsynth.evolution"""
