"""dpsynth.federated"""
