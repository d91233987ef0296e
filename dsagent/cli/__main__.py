from dsagent.cli import main

main()
