"""python -m dpsynth"""

from .cli import main

main()
