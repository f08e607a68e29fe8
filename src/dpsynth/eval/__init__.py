"""dpsynth.eval"""
