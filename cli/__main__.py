from rhino.cli.main import main

main()
