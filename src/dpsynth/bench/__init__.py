"""dpsynth.bench"""
