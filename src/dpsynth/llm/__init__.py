"""dpsynth.llm"""
