from reach.cli.commands import main

main()
