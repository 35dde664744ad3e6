"""Speed features: the controller, rebalancing, work stealing, the codecs of the leaders' link
(one codec base; int8 and PowerSGD over it) and the measured ``auto`` hierarchy."""
