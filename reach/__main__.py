from reach.cli import main

main()
