"""python -m dpsynth.cli"""

from . import main

main()
