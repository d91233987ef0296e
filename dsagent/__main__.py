from dsagent.cli.agent import main

main()
