"""How the flows reach Whitney, apart from the tasks themselves: the picklable connection and
its client, the tasks' retry policy, `WhitneyCalls` (a task on a connection with its policy),
the names and labels flows give things on Whitney, and releasing a flow run's sessions."""
