"""dpsynth.rag"""
